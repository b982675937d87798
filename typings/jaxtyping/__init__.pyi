# How mypy reads jaxtyping's array annotations (pyproject's [tool.mypy] mypy_path points here).
#
# `Float[Tensor, "batch pos d_model"]` is a Tensor; its second argument is a dimension string that jaxtyping
# checks at run time when asked to, not a type.  Read through jaxtyping itself (or taken as Any), mypy parses a
# one-word string such as " head" as a forward reference and reports an undefined name.  As `Annotated`, the
# string is metadata and the annotation is the Tensor type, which is what these annotations mean.
from typing import Annotated as Bool
from typing import Annotated as Float
from typing import Annotated as Int
from typing import Annotated as Shaped

__all__ = ["Bool", "Float", "Int", "Shaped"]
