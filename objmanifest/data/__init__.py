"""Data: sources, write-once single objects and their destinations, chunked entries
(``chunked``, multipart uploads that any machine can adopt) and the side effects of entry
transitions on uploads.

It moves bytes and verifies them; it never decides an entry's state (the commit loop
commits that).
"""
