"""The leaf layer: what every other layer may use, and which imports none of them.

* :mod:`.protocol`: the model contract (``HookedModel``, ``LayerInfo``), as one table;
* :mod:`.errors`: the project's exception classes; :mod:`.arguments`: one-line checks of argument types;
* :mod:`.indices`: layer, head and row indices from what users pass; :mod:`.hook_names`: hook names a caller hands in;
* :mod:`.model_state`: eval/grad-mode guards that leave a user's model as it was;
* :mod:`.results_io`: atomic result files; :mod:`.readout`: metrics read off the logits;
* :mod:`.sharpness`: row entropy, top-1 mass and the sharp-vs-smooth index; :mod:`.rotary`: rotary embeddings;
* :mod:`.lazy`: lazy package attributes (nothing heavy is imported until used).
"""
