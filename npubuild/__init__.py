"""npubuild: deploy neural networks on NPUs from one reviewed YAML recipe.

The public API is in `npubuild.api`; this package root stays import-light so the CLI starts fast.
"""

__version__ = "0.1.0"
