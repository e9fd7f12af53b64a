"""`whole_number`: a request's count or seed field as an int, or the one-line error that names the field.

The page's sliders and Number fields send floats (4.0); the HTTP API sends whatever JSON holds (null, "4", 2.5,
1e999, true). Every whole-number field of the app (max new tokens, the seeds, batches per checkpoint) is read
here, so each refusal reads alike and none of them is an internal error from converting the value first.
"""

from __future__ import annotations

from codeparrot.errors import CodeParrotError


def whole_number(value, what: str, *, within: tuple[int, int] | None = None, why: str = "") -> int:
    """`value` as an int when it is a whole number (in `within`, inclusive, when given); otherwise
    "`what` must be a whole number[ from LOW to HIGH]`why`, got VALUE"."""
    number = _as_int(value)
    if number is None or (within is not None and not within[0] <= number <= within[1]):
        span = f" from {within[0]} to {within[1]}" if within is not None else ""
        raise CodeParrotError(f"{what} must be a whole number{span}{why}, got {value!r}")
    return number


def _as_int(value) -> int | None:
    if isinstance(value, bool):  # an int to Python, but a checkbox's value, not a number anyone typed
        return None
    if isinstance(value, int):
        return value  # exact: a float would round a large seed
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass  # "4.0" and "1e3" are whole numbers too
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return int(number) if number.is_integer() else None  # is_integer is False for nan and inf
