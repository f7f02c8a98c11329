"""Drawings of the tuning machine, made by `transitions` from the machine's own definition."""

from __future__ import annotations

from pathlib import Path

from .errors import FastaError
from .machine import STATES, TRANSITIONS


class MissingGraphviz(FastaError):
    """The graphviz package is there but its `dot` program is not."""


class _Model:
    """A bare model: the diagram needs a machine, not a tune."""


def draw_machine(fmt: str = "mermaid", out: Path | None = None) -> str:
    """Mermaid text (no system packages needed), or PNG/SVG through graphviz."""
    from transitions.extensions import GraphMachine

    engine = "mermaid" if fmt == "mermaid" else "graphviz"
    if engine == "graphviz":
        try:
            import graphviz  # noqa: F401
        except ImportError:
            raise ImportError(
                f"--format {fmt} needs the 'graphviz' Python package and Graphviz's dot "
                "(pip install graphviz; apt-get install graphviz); --format mermaid needs neither"
            ) from None
    model = _Model()
    GraphMachine(
        model=model,
        states=STATES,
        transitions=TRANSITIONS,
        initial="R1",
        auto_transitions=False,
        graph_engine=engine,
        show_conditions=True,
        title="fasta-sm tune",
        model_attribute="machine_state",
    )
    graph = model.get_graph()
    if engine == "mermaid":
        text = graph.draw(None)
        if out is not None:
            out.write_text(text)
        return text
    if out is None:
        raise ValueError(f"--format {fmt} needs --out FILE")
    import graphviz

    try:
        graph.draw(str(out), format=fmt, prog="dot")
    except graphviz.ExecutableNotFound:
        raise MissingGraphviz(
            f"--format {fmt} needs Graphviz's dot program (apt-get install graphviz); --format mermaid does not"
        ) from None
    return str(out)
