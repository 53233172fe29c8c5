"""Command-line reports built on the library: the DP balance report and the memory plan."""
