"""Images and audio in the engine (src/corral/worker/media/)."""
