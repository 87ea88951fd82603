package controlplane

import (
	"errors"
	"fmt"
	"net/http"

	"space/api"
	"space/internal/errkind"
	"space/internal/httpapi"
	"space/internal/store"
)

func keyView(k store.APIKey) api.APIKey {
	return api.APIKey{ID: k.ID, Team: k.TeamID, Name: k.Name, Admin: k.Admin, CreatedAt: k.Created}
}

// teamParam returns the team a key request is about: the caller's, or the
// one named, which needs an admin key.
func teamParam(c caller, named string) (string, error) {
	if named == "" || named == c.team {
		return c.team, nil
	}
	if !c.admin {
		return "", fmt.Errorf("keys of another team need an admin key: %w", errkind.PermissionDenied)
	}
	if !store.ValidID(named) {
		return "", httpapi.Invalid("team", "%.64q: 1-128 characters of [A-Za-z0-9_.-]", named)
	}
	return named, nil
}

func (s *Server) handleCreateKey(w http.ResponseWriter, r *http.Request) {
	c := callerOf(r)
	var req api.CreateAPIKey
	if err := httpapi.DecodeJSON(r, &req); err != nil {
		httpapi.WriteError(w, err)
		return
	}
	team, err := teamParam(c, req.Team)
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	if req.Admin && !c.admin {
		httpapi.WriteError(w, fmt.Errorf("creating an admin key needs an admin key: %w", errkind.PermissionDenied))
		return
	}
	if len(req.Name) > 256 {
		httpapi.WriteError(w, httpapi.Invalid("name", "longer than 256 bytes"))
		return
	}
	if team != c.team {
		if _, err := s.cfg.Store.CreateTeam(r.Context(), store.Team{ID: team, Name: team}); err != nil && !errors.Is(err, store.ErrAlreadyExists) {
			httpapi.WriteError(w, err)
			return
		}
	}
	k, secret, err := s.newKey(r.Context(), team, req.Name, req.Admin)
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	noteCreated(r.Context(), k.ID)
	v := keyView(k)
	v.Secret = secret
	httpapi.WriteJSON(w, http.StatusCreated, v)
}

func (s *Server) handleListKeys(w http.ResponseWriter, r *http.Request) {
	team, err := teamParam(callerOf(r), r.URL.Query().Get("team"))
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	keys, err := s.cfg.Store.ListAPIKeys(r.Context(), team)
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	out := api.APIKeyList{Keys: make([]api.APIKey, 0, len(keys))}
	for _, k := range keys {
		out.Keys = append(out.Keys, keyView(k))
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
}

func (s *Server) handleDeleteKey(w http.ResponseWriter, r *http.Request) {
	team, err := teamParam(callerOf(r), r.URL.Query().Get("team"))
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	id := r.PathValue("id")
	if !store.ValidID(id) {
		httpapi.WriteError(w, fmt.Errorf("api key %.64q: %w", id, store.ErrNotFound))
		return
	}
	if err := s.cfg.Store.DeleteAPIKey(r.Context(), team, id); err != nil {
		httpapi.WriteError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
