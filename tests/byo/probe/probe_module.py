import json
import sys

with open(sys.argv[1], "w") as f:
    json.dump({"argv": sys.argv, "name": __name__, "path0": sys.path[0]}, f)
