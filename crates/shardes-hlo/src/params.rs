//! Parameter trees.
