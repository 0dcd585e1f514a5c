"""Running the proxy: the command line, config loading, serving, workers."""
