"""Training the toy zoo and the development checks around it (not needed to use the shipped models).

* :mod:`.train` - ``python -m gather_aggregate.training.train``: train one zoo model (the commands of every
  shipped model are in its ``LINEAGE.md``);
* :mod:`.vocab` - the word-level world (keys, values, entities, colours) and its tokenizer;
* :mod:`.data` - the training documents, in the task formats of :mod:`gather_aggregate.tasks`;
* :mod:`.quick_eval`, :mod:`.ablation_check` - fast accuracy checks used while training.

The shipped checkpoints and ``list_zoo`` / ``zoo_path`` stay in :mod:`gather_aggregate.zoo`.
"""
