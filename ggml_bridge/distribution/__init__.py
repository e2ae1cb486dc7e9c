"""Building and distributing llama-server: CMake/Ninja builds, the web UI, the server's sdist and wheel."""
