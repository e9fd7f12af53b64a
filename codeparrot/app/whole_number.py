"""`whole_number`: a request's count or seed field as an int, or the one-line error that names the field.

The page's sliders and Number fields send floats (4.0); the HTTP API sends whatever JSON holds (null, "4", 2.5,
1e999, true). Every whole-number field of the app (max new tokens, the seeds, batches per checkpoint) is read
here, so each refusal reads alike and none of them is an internal error from converting the value first.
"""

from __future__ import annotations

from codeparrot.errors import CodeParrotError


def whole_number(value, what: str, *, within: tuple[int, int | None] | None = None, why: str = "") -> int:
    """`value` as an int when it is a whole number (in `within`, inclusive, when given; HIGH None: no upper
    bound); otherwise "`what` must be a whole number[ from LOW to HIGH | of at least LOW]`why`, got VALUE"."""
    number = _as_int(value)
    low, high = within if within is not None else (None, None)
    if number is None or (low is not None and number < low) or (high is not None and number > high):
        span = "" if within is None else f" from {low} to {high}" if high is not None else f" of at least {low}"
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
