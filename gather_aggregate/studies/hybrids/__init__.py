"""Retrieval-guided hybrids as experiments: :mod:`.choose` (which heads stay attention), :mod:`.distill` (MOHAWK),
:mod:`.graft` (attention grafted into an SSM head), and the toy sweeps :mod:`.experiment`, :mod:`.graft_experiment`,
:mod:`.shipped`.
"""
