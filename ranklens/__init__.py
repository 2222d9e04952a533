"""ranklens: where did each training step's time go, on which rank, and what to change."""

__version__ = "0.1.0"
