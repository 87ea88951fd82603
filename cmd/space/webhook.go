package main

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"space/api"
	"space/client"
)

func newWebhookCmd(g *globals) *cobra.Command {
	return newGroupCmd("webhook", "Push your team's lifecycle events to URLs (signed, at least once)",
		newWebhookCreateCmd(g), newWebhookListCmd(g), newWebhookRemoveCmd(g), newWebhookDeliveriesCmd(g),
		newWebhookTestCmd(g), newWebhookEnableCmd(g, "enable", true), newWebhookEnableCmd(g, "disable", false))
}

func newWebhookCreateCmd(g *globals) *cobra.Command {
	var req api.CreateWebhook
	c := withOutput(g, &cobra.Command{
		Use:   "create URL [--type T]... [--description D]",
		Short: "Register a webhook and print its signing secret (only this once)",
		Long: `Register URL to receive your team's lifecycle events from now on: each
event is POSTed as JSON, in order, at least once (the Space-Webhook-Id
header is the same on every retry), and signed with the secret printed
here, which cannot be shown again. See docs/operations.md, "Webhooks",
for how to verify a delivery.

The URL must be https, and its host must resolve only to public
addresses unless the server runs with --webhook-allow-private.`,
		Args: cobra.ExactArgs(1),
	}, func(cmd *cobra.Command, cl *client.Client, args []string) (api.Webhook, error) {
		req.URL = args[0]
		return cl.CreateWebhook(cmd.Context(), req)
	}, func(h api.Webhook) error {
		if err := g.printWebhook(h); err != nil {
			return err
		}
		fmt.Fprintln(g.stderr, "space: save the secret now: it cannot be shown again")
		return nil
	})
	f := c.Flags()
	f.StringArrayVar(&req.Types, "type", nil, "send only events of this `type` (repeatable; default: every type)")
	f.StringVar(&req.Description, "description", "", "a note for people")
	return c
}

// printWebhook prints a webhook's fields (its secret only when the
// server sent it: at creation).
func (g *globals) printWebhook(h api.Webhook) error {
	types := strings.Join(h.Types, ", ")
	if types == "" {
		types = "all"
	}
	return g.printFields("id", h.ID, "url", h.URL, "types", types, "description", h.Description,
		"enabled", strconv.FormatBool(h.Enabled), "disabled reason", h.DisabledReason,
		"failures", strconv.Itoa(h.Failures), "cursor", h.Cursor, "created", g.ago(h.CreatedAt), "secret", h.Secret)
}

func newWebhookListCmd(g *globals) *cobra.Command {
	return withOutput(g, &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List your team's webhooks",
		Args:    cobra.NoArgs,
	}, func(cmd *cobra.Command, cl *client.Client, _ []string) (api.WebhookList, error) {
		hs, err := cl.Webhooks(cmd.Context())
		return api.WebhookList{Webhooks: nonNil(hs)}, err
	}, func(l api.WebhookList) error {
		return g.printTable([]string{"ID", "URL", "TYPES", "ENABLED", "FAILURES", "CREATED"}, func(row func(...any)) {
			for _, h := range l.Webhooks {
				types := strings.Join(h.Types, ",")
				if types == "" {
					types = "all"
				}
				enabled := strconv.FormatBool(h.Enabled)
				if h.DisabledReason != "" {
					enabled += " (" + h.DisabledReason + ")"
				}
				row(h.ID, h.URL, types, enabled, h.Failures, g.ago(h.CreatedAt))
			}
		})
	})
}

func newWebhookRemoveCmd(g *globals) *cobra.Command {
	c := newEachCmd(g, "rm", "Delete webhooks of your team", (*client.Client).DeleteWebhook)
	c.Aliases = []string{"delete"}
	return c
}

func newWebhookDeliveriesCmd(g *globals) *cobra.Command {
	var limit int
	c := withOutput(g, &cobra.Command{
		Use:   "deliveries ID [--limit N]",
		Short: "List a webhook's last delivery attempts, newest first",
		Args:  cobra.ExactArgs(1),
	}, func(cmd *cobra.Command, cl *client.Client, args []string) (api.WebhookDeliveryList, error) {
		ds, err := cl.WebhookDeliveries(cmd.Context(), args[0], limit)
		return api.WebhookDeliveryList{Deliveries: nonNil(ds)}, err
	}, func(l api.WebhookDeliveryList) error {
		return g.printTable([]string{"EVENT", "TYPE", "ATTEMPT", "WHEN", "STATUS", "MS", "RESULT"}, func(row func(...any)) {
			for _, d := range l.Deliveries {
				row(d.EventID, d.EventType, d.Attempt, g.ago(d.Time), d.StatusCode, d.DurationMS, deliveryResult(d))
			}
		})
	})
	c.Flags().IntVar(&limit, "limit", 0, "show at most `n` attempts (default: all kept, up to 200)")
	return c
}

// deliveryResult says how an attempt went in a few words.
func deliveryResult(d api.WebhookDelivery) string {
	switch {
	case d.Delivered:
		return "delivered"
	case d.Error != "":
		return d.Error
	}
	return "failed"
}

func newWebhookTestCmd(g *globals) *cobra.Command {
	return withOutput(g, &cobra.Command{
		Use:   "test ID",
		Short: "Send a signed ping event to a webhook now and show how it went",
		Args:  cobra.ExactArgs(1),
	}, func(cmd *cobra.Command, cl *client.Client, args []string) (api.WebhookDelivery, error) {
		return cl.TestWebhook(cmd.Context(), args[0])
	}, func(d api.WebhookDelivery) error {
		return g.printFields("result", deliveryResult(d), "status", strconv.Itoa(d.StatusCode),
			"duration", strconv.FormatInt(d.DurationMS, 10)+" ms")
	})
}

func newWebhookEnableCmd(g *globals, verb string, enable bool) *cobra.Command {
	short := "Resume a webhook's deliveries after the last event delivered (and clear its failures)"
	if !enable {
		short = "Stop a webhook's deliveries until it is enabled again"
	}
	return withOutput(g, &cobra.Command{
		Use:   verb + " ID",
		Short: short,
		Args:  cobra.ExactArgs(1),
	}, func(cmd *cobra.Command, cl *client.Client, args []string) (api.Webhook, error) {
		return cl.UpdateWebhook(cmd.Context(), args[0], api.UpdateWebhook{Enabled: &enable})
	}, g.printWebhook)
}
