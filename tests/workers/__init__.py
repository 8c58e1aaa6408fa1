"""Worker programs the tests run as separate processes (each a script, run by its path):
``agent`` (an agent racing others), ``chunked`` (a producer of chunked entries that crashes
or stalls), ``journal`` (commits killed mid-way), ``upgrade`` (run under objmanifest 0.1.0;
only that release's API)."""
