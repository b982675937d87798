"""``HookedHeadHybrid``: a Llama-family transformer in which some heads stay softmax attention and the rest are
Mamba-2-style SSM heads (:mod:`.config`, :mod:`.layers`, :mod:`.model`), built from a teacher by :mod:`.build`.
"""
