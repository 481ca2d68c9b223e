"""A plugin with a syntax error."""

def oops(:
    pass
