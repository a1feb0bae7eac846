//! JAX-compatible threefry random numbers.
