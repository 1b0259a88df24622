"""The pure core of the inference path: value types, errors and the policies that decide what to do."""
