"""The one error class for bad user input: the CLI prints it on one line and exits 2."""


class SpecError(ValueError):
    """Invalid user input. The message names the field, the value and the fix."""

    def __init__(self, field: str, value, fix: str):
        self.field, self.value, self.fix = field, value, fix
        super().__init__(f"{field}={value!r}: {fix}")


def require(ok: bool, field: str, value, fix: str) -> None:
    """Raise SpecError(field, value, fix) unless ok."""
    if not ok:
        raise SpecError(field, value, fix)


def positive_int(field: str, value) -> int:
    require(isinstance(value, int) and not isinstance(value, bool) and value > 0,
            field, value, "must be a positive integer")
    return value


def positive_float(field: str, value) -> float:
    require(isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0,
            field, value, "must be a positive number")
    return float(value)
