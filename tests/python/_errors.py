"""The suite's one way of expecting an error.

    with raises(TypeError, "q.dtype must be float32"):
        ...
    with raises(MFAError, "out overlaps q", status="INVALID_ARGUMENT") as caught:
        ...

The block must raise `error` (a type or a tuple of types); `message`, when given, must be a
literal prefix of the error's message (for an MFAError, of the library's message, without the
status that str() appends); `status`, when given, is the MFAError's status_name. The pytest
ExceptionInfo is yielded for further checks."""

import contextlib

import pytest
from mfa_native import MFAError


@contextlib.contextmanager
def raises(error, message=None, *, status=None):
    with pytest.raises(error) as caught:
        yield caught
    raised = caught.value
    text = raised.message if isinstance(raised, MFAError) else str(raised)
    if message is not None:
        assert text.startswith(message), f"{text!r} does not start with {message!r}"
    if status is not None:
        assert isinstance(raised, MFAError), f"{raised!r} is not a library error"
        assert raised.status_name == status, f"status {raised.status_name}, expected {status}"
