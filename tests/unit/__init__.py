"""Pure code: no processes, servers, sockets or subprocesses; each test takes milliseconds."""
