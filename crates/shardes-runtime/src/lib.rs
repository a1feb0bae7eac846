//! shardes-runtime
