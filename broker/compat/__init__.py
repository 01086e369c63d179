"""Every override of another library's internals, one module per library.

The broker leans on a few non-public parts of ``websockets``, ``uvicorn`` and ``redis-py``
where their public APIs cost too much (measured: see each module). Each module here holds
all of that library's, and ``tests/test_compat_<library>.py`` checks every internal it
assumes, so that an upgrade past the bounds in ``pyproject.toml`` fails a named test rather
than production. No other module subclasses those libraries' classes or reads their private
names (``tests/test_layout.py``); these modules import nothing of the project.
"""
