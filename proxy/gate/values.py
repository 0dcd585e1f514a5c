"""Value types made per request: immutable to the type checker, cheap to make at run time.

A frozen dataclass's constructor sets each field through `object.__setattr__`, a call per
field: the seven records a request makes on its way through (`Request`, `Forward`, `Target`,
...) cost some 70 k instructions a request that way (`python bench/instructions.py`, issue
26). `value` makes a slots dataclass that mypy treats as frozen (PEP 681's `frozen_default`),
so that assigning to a field is a type error, while at run time its fields are set directly.
Like a frozen dataclass, it is compared by its fields; unlike one, it is not hashable.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

T = TypeVar("T")

if TYPE_CHECKING:
    from typing_extensions import dataclass_transform

    @dataclass_transform(frozen_default=True, field_specifiers=(field,))
    def value(cls: type[T]) -> type[T]: ...

else:

    def value(cls: type[Any]) -> type[Any]:
        return dataclass(slots=True)(cls)
