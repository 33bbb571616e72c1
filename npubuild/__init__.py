"""npubuild: deploy neural networks on NPUs from one reviewed YAML recipe.

The public API (`npubuild.facade`, re-exported here): ``npubuild.load(path)`` gives a `Recipe`;
``recipe.with_(**{"field.path": value})`` a validated variant; ``recipe.plan()``,
``recipe.build()`` (a `Result`: ``passed``, ``fps``, ``npu_fps``, ``cosine``, ``report_html``)
and ``recipe.infer(inputs)``; ``npubuild.build/plan/infer`` take a recipe or a file. The package
root imports them lazily, so the CLI starts fast.
"""

__version__ = "0.1.0"

__all__ = ["BuildOptions", "Recipe", "Result", "build", "infer", "load", "plan"]


def __getattr__(name: str):
    if name in __all__:
        from npubuild import facade

        return getattr(facade, name)
    raise AttributeError(f"module 'npubuild' has no attribute {name!r}")
