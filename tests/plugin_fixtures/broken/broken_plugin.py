"""A plugin that fails to import."""

import treg_no_such_module_anywhere  # noqa: F401
