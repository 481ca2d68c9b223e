"""The dashboard's templates and static files, installed as the ``treg_templates`` package (setup.py)."""
