"""The one idiom of every patch: replace an attribute of fairseq, torch or Python once per process.

fairseq's ``--user-dir`` imports the plugin in each process it starts, a test may import it again, and a
second copy of the plugin (another checkout on ``sys.path``) must not wrap a replacement in a second
one. So a replacement is marked, and an attribute that already holds a marked one is left alone.
"""

MARK = "man_fairseq_patch"


def install(owner, name, make):
    """Set ``owner.name`` to ``make(original)`` unless it is a replacement of ours already; returns
    whether it was set. ``make`` receives what it replaces, so each replacement can call it."""
    original = getattr(owner, name)
    if getattr(original, MARK, False):
        return False
    replacement = make(original)
    setattr(replacement, MARK, True)
    setattr(owner, name, replacement)
    return True


def installed(owner, name):
    """Whether ``owner.name`` is a replacement of ours."""
    return getattr(getattr(owner, name), MARK, False)
