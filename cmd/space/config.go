package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"space/client"
	"space/internal/server"
)

// Files space server writes into its data directory for the client verbs
// on the same host.
const (
	serverInfoFile = server.InfoFile     // a serverInfo (JSON)
	adminKeyFile   = server.AdminKeyFile // the first admin key's secret, 0600
)

// defaultAPIURL is where client verbs look for the API when neither
// SPACE_API_URL nor server.json says.
const defaultAPIURL = "http://127.0.0.1:7070"

// serverInfo is the content of DATA_DIR/server.json.
type serverInfo = server.Info

// defaultDataDir is the data directory when neither --data-dir nor
// SPACE_DATA_DIR sets it: /var/lib/space for root, else
// $XDG_DATA_HOME/space or ~/.local/share/space ("" when there is no home).
func defaultDataDir() string {
	if os.Geteuid() == 0 {
		return "/var/lib/space"
	}
	if d := os.Getenv("XDG_DATA_HOME"); filepath.IsAbs(d) {
		return filepath.Join(d, "space")
	}
	if h, err := os.UserHomeDir(); err == nil {
		return filepath.Join(h, ".local", "share", "space")
	}
	return ""
}

// apiEndpoint returns the API's base URL and the API key client verbs
// use. The URL is $SPACE_API_URL, else the one in DATA_DIR/server.json,
// else defaultAPIURL. The key is $SPACE_API_KEY, else the one in
// DATA_DIR/admin.key.
func (g *globals) apiEndpoint() (url, key string, err error) {
	url = g.getenv("SPACE_API_URL")
	if url == "" {
		url = defaultAPIURL
		if g.dataDir != "" {
			info, err := readServerInfo(g.dataDir)
			switch {
			case err == nil && info.URL != "":
				url = info.URL
			case err != nil && !errors.Is(err, fs.ErrNotExist):
				return "", "", err
			}
		}
	}
	key = g.getenv("SPACE_API_KEY")
	if key != "" {
		return url, key, nil
	}
	noKey := "no API key: set SPACE_API_KEY or start `space server` (it writes DATA_DIR/admin.key)"
	if g.dataDir == "" {
		return "", "", errors.New(noKey)
	}
	path := filepath.Join(g.dataDir, adminKeyFile)
	noKey = strings.Replace(noKey, "DATA_DIR/admin.key", path, 1)
	key, err = readAdminKey(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return "", "", errors.New(noKey)
	case err != nil:
		return "", "", fmt.Errorf("%s: %w", noKey, err)
	case key == "":
		return "", "", fmt.Errorf("%s: %s is empty", noKey, path)
	}
	return url, key, nil
}

// client returns an API client set up by apiEndpoint.
func (g *globals) client() (*client.Client, error) {
	url, key, err := g.apiEndpoint()
	if err != nil {
		return nil, err
	}
	return client.New(url, key)
}

func readServerInfo(dataDir string) (serverInfo, error) {
	var info serverInfo
	b, err := os.ReadFile(filepath.Join(dataDir, serverInfoFile))
	if err != nil {
		return info, err
	}
	if err := json.Unmarshal(b, &info); err != nil {
		return info, fmt.Errorf("read %s: %w", filepath.Join(dataDir, serverInfoFile), err)
	}
	return info, nil
}

// readAdminKey returns the first line of the key file at path.
func readAdminKey(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Scan()
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("read %s: %w", path, err)
	}
	return strings.TrimSpace(sc.Text()), nil
}
