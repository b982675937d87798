"""Randomised small configs of every supported family (:mod:`.draws`, :mod:`.bridge_draws`, :mod:`.decoder_draws`)
and how a drawn config is checked against its reference (:mod:`.check`).
"""
