"""Optional dependencies: import one, or say which extra of torch-semiring installs it."""
import importlib


def require(module: str, extra: str):
    """Import `module`, or raise ImportError naming the pip extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ImportError(
            f"{module} is not installed; install it with: pip install 'torch-semiring[{extra}]'"
        ) from error
