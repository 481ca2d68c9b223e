"""hub tools: hub_tools, hub_runs and treg_hub_take(); calls: hub_ref, hub_caller_org, key (id, org_id)

An org publishes one of its tools as ``<org-slug>.<name>`` (``hub_tools``); every hub call running
holds one ``hub_runs`` row, its slot, taken by ``treg_hub_take`` in one statement (the publishing
org's advisory lock held for that statement only: at most ``TREG_HUB_MAX_RUNS_PER_TEAM`` runs of one
publisher and ``max_runs`` of one tool, across every process). A hub call is audited twice under one
call id, once in each org, so the calls table's key becomes (id, org_id) (docs/sharing.md "Hub").

Revision ID: 0019
Revises: 0018
"""
from alembic import op
import sqlalchemy as sa

revision = '0019'
down_revision = '0018'
branch_labels = None
depends_on = None

#: the advisory lock class of a publisher's slots (ASCII "treg"); the second key is hashtext(org id)
HUB_TAKE = r"""
CREATE OR REPLACE FUNCTION treg_hub_take(
    p_run text, p_publisher text, p_tool text, p_caller text, p_holder text, p_team_limit integer,
    p_tool_limit integer, p_lease_s double precision)
RETURNS TABLE (refused text, active integer, limit_runs integer)
LANGUAGE plpgsql AS $fn$
DECLARE
    v_team integer;
    v_tool integer;
BEGIN
    -- one publisher's takes are serialised for this one statement (a transaction of its own): two
    -- processes can never both see the last free slot
    PERFORM pg_advisory_xact_lock(1953654119, hashtext(p_publisher));
    -- a slot whose process died (its lease not renewed) is free again
    DELETE FROM hub_runs r WHERE r.publisher_org_id = p_publisher AND r.expires_at <= now();
    SELECT count(*), count(*) FILTER (WHERE r.hub_tool_id = p_tool) INTO v_team, v_tool
      FROM hub_runs r WHERE r.publisher_org_id = p_publisher;
    IF p_tool_limit IS NOT NULL AND v_tool >= p_tool_limit THEN
        RETURN QUERY SELECT 'tool'::text, v_tool, p_tool_limit;
        RETURN;
    END IF;
    IF v_team >= p_team_limit THEN
        RETURN QUERY SELECT 'team'::text, v_team, p_team_limit;
        RETURN;
    END IF;
    INSERT INTO hub_runs (id, publisher_org_id, hub_tool_id, caller_org_id, holder, expires_at)
         VALUES (p_run, p_publisher, p_tool, p_caller, p_holder, now() + make_interval(secs => p_lease_s));
    RETURN QUERY SELECT NULL::text, v_team + 1, p_team_limit;
END
$fn$;
"""


def upgrade() -> None:
    op.add_column('calls', sa.Column('hub_ref', sa.String(length=264), nullable=True))
    op.add_column('calls', sa.Column('hub_caller_org', sa.String(length=64), nullable=True))
    op.drop_constraint('pk_calls', 'calls', type_='primary')
    op.create_primary_key('pk_calls', 'calls', ['id', 'org_id'])
    op.create_table('hub_tools',
    sa.Column('id', sa.String(length=40), nullable=False),
    sa.Column('org_id', sa.String(length=40), nullable=False),
    sa.Column('tool_id', sa.String(length=40), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('description', sa.Text(), server_default=sa.text("''"), nullable=False),
    sa.Column('price_micro', sa.BigInteger(), server_default=sa.text('0'), nullable=False),
    sa.Column('max_runs', sa.Integer(), nullable=True),
    sa.Column('created_by', sa.String(length=40), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint('price_micro >= 0', name=op.f('ck_hub_tools_price')),
    sa.CheckConstraint('max_runs IS NULL OR max_runs >= 1', name=op.f('ck_hub_tools_max_runs')),
    sa.ForeignKeyConstraint(['org_id'], ['orgs.id'], name=op.f('fk_hub_tools_org_id_orgs'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['tool_id'], ['tools.id'], name=op.f('fk_hub_tools_tool_id_tools'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_hub_tools')),
    sa.UniqueConstraint('org_id', 'name', name=op.f('uq_hub_tools_org_id_name'))
    )
    op.create_table('hub_runs',
    sa.Column('id', sa.String(length=64), nullable=False),
    sa.Column('publisher_org_id', sa.String(length=40), nullable=False),
    sa.Column('hub_tool_id', sa.String(length=40), nullable=False),
    sa.Column('caller_org_id', sa.String(length=40), nullable=False),
    sa.Column('holder', sa.String(length=64), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('expires_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['publisher_org_id'], ['orgs.id'], name=op.f('fk_hub_runs_publisher_org_id_orgs'),
                            ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_hub_runs'))
    )
    op.create_index('ix_hub_runs_publisher_org_id', 'hub_runs', ['publisher_org_id'], unique=False)
    op.execute(HUB_TAKE)


def downgrade() -> None:
    op.execute("DROP FUNCTION IF EXISTS treg_hub_take(text, text, text, text, text, integer, integer, "
               "double precision)")
    op.drop_index('ix_hub_runs_publisher_org_id', table_name='hub_runs')
    op.drop_table('hub_runs')
    op.drop_table('hub_tools')
    # the second row of each hub call (the publisher's) cannot survive a key of id alone
    op.execute("DELETE FROM calls c WHERE c.hub_caller_org IS NOT NULL "
               "AND EXISTS (SELECT 1 FROM calls o WHERE o.id = c.id AND o.org_id <> c.org_id)")
    op.drop_constraint('pk_calls', 'calls', type_='primary')
    op.create_primary_key('pk_calls', 'calls', ['id'])
    op.drop_column('calls', 'hub_caller_org')
    op.drop_column('calls', 'hub_ref')
