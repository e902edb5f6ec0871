package dlp

import "testing"

// TestInternalHostsAndULA: internal host names and IPv6 unique local
// addresses are redacted where internal addresses are (external and
// public destinations); look-alikes pass untouched.
func TestInternalHostsAndULA(t *testing.T) {
	t.Parallel()
	e := mustEngine(t, Config{})
	wantRedacted(t, e, CatInternalIP, []detection{
		{"DB_HOST=db1.prod.internal\n", "db1.prod.internal"},
		{"curl http://build.corp:8080/api", "build.corp"},
		{`{"printer":"laser-3.LOCAL"}`, "laser-3.LOCAL"},
		{"ssh git.eng.corp", "git.eng.corp"},
		{"nas at http://nas.lan:5000/", "nas.lan"},
		{"addr fd12:3456:789a:1::1 up", "fd12:3456:789a:1::1"},
		{"[FD00::5]:443", "FD00::5"},
	}, []Class{ClassExternal, ClassPublic}, []Class{ClassInternal})
	wantUntouched(t, e, []string{
		"http://localhost:3000/ and 127.0.0.1",
		"import golang.org/x/tools/internal/event",
		"the .internal suffix, a .corporate site, x.localhost",
		"metadata.internal.example.com",
		"var my_var.local = 1; ${HOST}.local",
		"addr 2001:db8::1 and fe80::1 and fd is a flag; fdfd:",
		"hash fd12ab34:",
		"a plan, a clan. .lan is a suffix; x.lane y.landing",
	}, ClassExternal, ClassPublic)
}

// TestSingleLabelHosts: a single-label host name is redacted where
// internal addresses are, in host positions only (a URL's authority, a
// name before a service port, a Host header, user@host in ssh commands and
// git remotes); the same words elsewhere, localhost, placeholders and the
// default service names of common software pass untouched.
func TestSingleLabelHosts(t *testing.T) {
	t.Parallel()
	e := mustEngine(t, Config{})
	wantRedacted(t, e, CatInternalIP, []detection{
		{"see http://buildbox/job/42", "buildbox"},
		{"curl -s https://buildbox:8443/api?x=1", "buildbox"},
		{`{"url":"HTTP://Wiki01"}`, "Wiki01"},
		{"LDAPS://DC01:636", "DC01"},
		{"LDAP_URL=ldaps://ldap01:636\n", "ldap01"},
		{"ldap01:389 is the directory", "ldap01"},
		{`server = "pgmain:5432"`, "pgmain"},
		{"connect to ldap01:389.", "ldap01"},
		{"GET / HTTP/1.1\r\nHost: buildbox\r\nAccept: */*\r\n", "buildbox"},
		{"> Host: jenkins-prod:8080\n", "jenkins-prod"},
		{"git clone ssh://git@gitbox/team/app.git", "gitbox"},
		{"url = git@gitbox:team/app.git\n", "gitbox"},
		{"ssh -p 2222 deploy@buildbox uptime", "buildbox"},
		{"scp dump.sql ops@nas01:/backups/", "nas01"},
		{"rsync -a ./ deploy@web-03:/srv/app", "web-03"},
	}, []Class{ClassExternal, ClassPublic}, []Class{ClassInternal})
	wantUntouched(t, e, []string{
		// The same words outside host positions.
		"the buildbox runs ldap01 jobs; gitbox and nas01 too",
		"ssh into the buildbox and use ssh keys; scp is old",
		// Not single labels, or not hosts.
		"http://localhost:8080/ and https://github.com/org/repo and http://127.0.0.1:3000/",
		"file:///srv/x s3://my-bucket/key chrome://settings vscode://ext/x mailto:a",
		"http://${HOST}:${PORT}/ http://<host>/ http://{{ .Host }}/ https://[::1]:443/",
		"http://host:port/path http://HOST/ https://your-server/ http://server:8080/ https://my-server/",
		"--with-icu-source=http://url/to/icu.tgz and CONNECT name:443, http://name:443/ or https://evil/x",
		"http://123/ and https://x_y/",
		// Docker-compose and tutorial service names.
		"redis://redis:6379/0 http://db:5432 amqp://guest:guest@rabbitmq:5672/ http://api:8000",
		"- postgres:5432\n- elasticsearch:9200\n",
		// Ports that are not after a lone lower-case name.
		"FROM node:22\nimage: postgres:16\nMakefile:443: recipe failed",
		"ratio 16:9 at 12:30, x[lo:443], a.b:8080, {timeout:8080}, path/srv:8080, Port:8080",
		"build:8080.1 and ldap01:3890 and ldap01:389x",
		// Host headers only at a line's start, with nothing after the name.
		"X-Forwarded-Host: buildbox\nmy Host: buildbox\nHost: buildbox farm\n",
		// git@ and commands glued to words, e-mail addresses.
		"legit@gitbox:1 and ssh ops@db01.example.com",
	}, ClassExternal, ClassPublic)
}
