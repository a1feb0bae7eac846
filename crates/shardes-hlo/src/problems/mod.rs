//! Example problems.
