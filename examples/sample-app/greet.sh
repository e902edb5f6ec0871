#!/bin/sh
# Prints a greeting for each name given.
for name in "$@"; do
	echo "Hello, $name!"
done
