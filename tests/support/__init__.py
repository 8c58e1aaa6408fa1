"""Support code of the suite, imported as ``tests.support.X``: the servers and stores the
suites run against (``stores``), raw access to objects behind the manifest's back
(``rawstore``), fault-injecting proxies (``faults``), stalling and skewed stores
(``backends``), breaking files (``breaking``), the history checker (``checker``) and the
deterministic simulation (``sim``)."""
