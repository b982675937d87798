"""``python -m gather_aggregate.lm_eval ARGS``: lm-eval's own CLI with the ``gather_aggregate`` model registered."""

from __future__ import annotations

import sys


def main() -> None:
    from gather_aggregate.lm_eval import register

    register()
    from lm_eval.__main__ import cli_evaluate

    sys.argv[0] = "lm_eval"
    cli_evaluate()


if __name__ == "__main__":
    main()
