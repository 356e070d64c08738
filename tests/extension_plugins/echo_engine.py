"""A serving engine added from outside the package, as a plugin would: its launcher (the settings serve-config
prints) and its record, registered by the test that uses it (:func:`hf_posenc.engines.registry.register_engine`)."""

from hf_posenc.engines.launch import Launch
from hf_posenc.engines.registry import Engine


def launch(served, length):
    return Launch("Echo", "same", f"echo serves {served.method} up to {length or served.context} tokens",
                  command=["echo-serve", served.path])


ECHO = Engine("echo", "Echo", launch=launch)
