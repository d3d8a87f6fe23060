"""Library versions a plain install gets wrong for a target, named when they break it.

``torchtune`` 0.6.1 imports ``torchao.dtypes.nf4tensor``, which ``torchao`` 0.18 removed, so a
plain install fails at ``import torchtune``.  :func:`torchtune_problem` tries the import once
the files are written and returns one line naming the pin::

    torchtune cannot be imported here (ImportError: …nf4tensor…): torchtune 0.6.1 needs
    torchao==0.17.0 (pip install 'torchao==0.17.0', or pip install 'packshard[torchtune]')
"""

from __future__ import annotations

PINS = {"torchtune": "torchtune==0.6.1", "torchao": "torchao==0.17.0"}
"""The versions the torchtune export is tested with (the ``torchtune`` extra pins them)."""


def torchtune_problem() -> str | None:
    """Return why ``import torchtune`` fails here (None: it imports, or is not installed)."""
    try:
        import torchtune  # noqa: F401
    except Exception as exc:  # an incompatible torchao raises ImportError or AttributeError
        if isinstance(exc, ModuleNotFoundError) and exc.name == "torchtune":
            return None  # not installed: the recipe's machine is another one
        return (
            f"torchtune cannot be imported here ({type(exc).__name__}: {exc}): torchtune 0.6.1 "
            f"needs {PINS['torchao']} (pip install '{PINS['torchao']}', or pip install "
            "'packshard[torchtune]')"
        )
    return None
