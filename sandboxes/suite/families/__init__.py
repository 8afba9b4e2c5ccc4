"""Task families: name -> `make(seed) -> TaskSpec`. Add a family by adding a module and a line here."""
from sandboxes.suite.families import files

FAMILIES = {
    "files": files.make,
}
