"""The dashboard's templates and static files, installed as the ``treg.templates`` package (setup.py)."""
