"""Training data, tokenizer, training and evaluation of the embedded default model.

Modules:

* :mod:`.names` — disjoint train / test entity-name pools.
* :mod:`.world` — per-task generated worlds (file tree, key-value store, real tests).
* :mod:`.tools` — the real tools (calculator, search_files, read_file, run_tests,
  kv_get), their OpenAI schemas ``TOOLS`` and ``execute(world, name, arguments)``.
* :mod:`.transcripts` — synthetic agent transcripts and checkable ``Task`` s.
* :mod:`.corpus` — stdlib + transcripts, runtime-exact tokenisation, packing.
* :mod:`.tokenizer_train` — the byte-level BPE (``default_model/tokenizer.json``).
* :mod:`.train` — time-budgeted CPU training with checkpoints and resume.
* :mod:`.evaluate` — held-out perplexity and the agent-loop evaluation.

Commands (from a checkout, in the project venv)::

    python -m leyline_training.tokenizer_train        # ~30 s
    python -m leyline_training.corpus --transcripts 20000
    python -m leyline_training.train --out runs/default --minutes 70 \\
        --export leyline_runtime/default_model
    python -m leyline_training.evaluate --model runs/default/model --tasks 200 --out eval.json
"""
