"""Task families: name -> `make(seed) -> TaskSpec`. Add a family by adding a module and a line here."""
from sandboxes.suite.families import archives, data, debugging, files, git, scripting, sql, sysadmin, text

FAMILIES = {
    "files": files.make,
    "text": text.make,
    "git": git.make,
    "data": data.make,
    "scripting": scripting.make,
    "sysadmin": sysadmin.make,
    "archives": archives.make,
    "debugging": debugging.make,
    "sql": sql.make,
}
