#!/usr/bin/env bash
# Prints the path of libtcmalloc_minimal.so.4 from the loader's cache (package libtcmalloc-minimal4),
# or nothing when it is not installed. Used by the Makefile, setup_system.sh and bench_allocator.py.
{ ldconfig -p || /sbin/ldconfig -p; } 2>/dev/null | awk '$1 == "libtcmalloc_minimal.so.4" {print $NF; exit}'
exit 0
