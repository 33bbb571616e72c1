"""End-to-end verification: the deployed pipeline against the float model, the bisection that
names where a drop came from, and the detection picture. `npubuild.stages.verify` runs them."""
