//! Placeholder: filled in by the sockets work of issue 8.
