"""opgraph's version, in a leaf module so that any layer (the CLI's ``--version``) can read it without
importing the ``opgraph`` façade, which sits above every layer.

    >>> from opgraph._version import __version__
    >>> __version__.count(".") >= 1
    True
"""

__version__ = "0.1.0"
