//! Reading and writing parameter trees.
