"""Local tooling for the command line and demo: the S3-compatible servers started for
tests and the demo (moto, SeaweedFS), and terminal styles.

Never imported by the library below the public face.
"""
