// Keeps the target non-empty while the layer grows.
