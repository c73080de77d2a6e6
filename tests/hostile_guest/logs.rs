//! Placeholder: filled in by the logs work of issue 8.
