"""The commit loop: documents read and written only by conditional writes, their cache,
group-commit lanes, the retry policy, the journal block writer and the codecs.

It knows shards, the index and headers only as encoded documents and named changes; it
never decides what a change means (that is ``core``) nor moves data.
"""
