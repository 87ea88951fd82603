"""Keep a server running in a sandbox and fetch from it through an exposed port."""
from space_sdk import Sandbox

with Sandbox.create() as sb:
    sb.files.write("/srv/index.html", "<h1>served from a micro-VM</h1>\n")
    sb.commands.run("python3 -m http.server 8080 -d /srv", background=True).disconnect()
    sb.ports.wait_open(8080)
    page = sb.ports.get(8080, "/index.html")
    print(page.status_code, page.text, end="")
    assert page.status_code == 200 and "micro-VM" in page.text
