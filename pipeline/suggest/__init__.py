"""The suggestion system users get: the repository's past indexed, the candidates a diff has (its nearest
commits' messages, its changelog entry, its web editor's message, numbers moved to it), the selector
that chooses among them, and the model's own answers (`decoding`); saved beside the adapter for `use/`."""
