//! Synthetic training traces (not implemented yet).
